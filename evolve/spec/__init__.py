"""What a user writes and how it is resolved: the experiment spec, its resolution into an
environment, a policy and an optimizer, and the paper protocol's kept deviations."""
