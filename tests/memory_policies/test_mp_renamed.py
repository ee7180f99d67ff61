"""Renamed modules and names of `memory_policies` keep working, with a `RenamedWarning`,
until `deprecation.REMOVED_IN`; the new names work silently."""

from __future__ import annotations

import warnings

import pytest
from fresh_import import import_fresh

import memory_policies
from memory_policies.deprecation import RenamedWarning


def test_the_old_memory_system_module_warns_and_reexports() -> None:
    from memory_policies import memory_system

    with pytest.warns(RenamedWarning, match=r"memory_policies\.external_system .*memory_system"):
        old = import_fresh("memory_policies.external_system")
    assert old.MemorySystem is memory_system.MemorySystem
    with pytest.warns(RenamedWarning, match=r"ExternalSystemPolicy .*MemorySystemPolicy"):
        assert old.ExternalSystemPolicy is memory_system.MemorySystemPolicy
    with pytest.warns(RenamedWarning, match=r"ExternalSystemState .*MemorySystemState"):
        assert old.ExternalSystemState is memory_system.MemorySystemState


def test_the_old_memory_system_class_names_of_the_package_warn() -> None:
    with pytest.warns(RenamedWarning, match=r"memory_policies\.ExternalSystemPolicy "):
        assert memory_policies.ExternalSystemPolicy is memory_policies.MemorySystemPolicy
    with pytest.warns(RenamedWarning, match=r"memory_policies\.ExternalSystemState "):
        assert memory_policies.ExternalSystemState is memory_policies.MemorySystemState
    with pytest.raises(AttributeError, match="NoSuchName"):
        memory_policies.NoSuchName  # noqa: B018


def test_the_new_names_are_silent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedWarning)
        from memory_policies import MemorySystem, MemorySystemPolicy, MemorySystemState
        from memory_policies.memory_system import MemorySystemPolicy as same

        assert issubclass(MemorySystemState, memory_policies.MemoryState)
        assert same is MemorySystemPolicy and MemorySystem.search


def test_the_old_embedding_store_module_warns_and_reexports() -> None:
    from memory_policies import embedding_store

    with pytest.warns(RenamedWarning, match=r"memory_policies\.store .*embedding_store"):
        old = import_fresh("memory_policies.store")
    assert old.EmbeddingStorePolicy is embedding_store.EmbeddingStorePolicy
    assert old.StoreState is embedding_store.StoreState
