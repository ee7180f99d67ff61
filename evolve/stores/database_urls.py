"""Database URLs shared by the MLflow tracking store and Optuna's study storage: which
DB-API driver SQLAlchemy would load for a URL, and what to install when it is missing.

Checked up front because a missing driver otherwise surfaces as an `ImportError` traceback
from deep inside MLflow or Optuna, after the embedded server started.
"""

from __future__ import annotations

# pip packages of the DB-API drivers SQLAlchemy names (its default for postgresql:// is
# psycopg 3 since SQLAlchemy 2.1; for mysql:// it is mysqlclient).
DRIVER_PACKAGES = {
    "psycopg": "'amemgym-evolve[postgres]' (psycopg 3)",
    "psycopg2": "psycopg2-binary",
    "pg8000": "pg8000",
    "mysqldb": "mysqlclient",
    "pymysql": "PyMySQL",
    "mysqlconnector": "mysql-connector-python",
    "mariadbconnector": "mariadb",
    "oracledb": "oracledb",
    "cx_oracle": "cx_Oracle",
    "pyodbc": "pyodbc",
}


def missing_driver_message(url: str) -> str | None:
    """Why SQLAlchemy cannot open `url` for want of a driver (what to install), or None
    (installed, or not a URL SQLAlchemy parses: other checks say so)."""
    import sqlalchemy
    import sqlalchemy.exc

    try:
        parsed = sqlalchemy.engine.make_url(url)
        dialect = parsed.get_dialect()
    except (sqlalchemy.exc.NoSuchModuleError, sqlalchemy.exc.ArgumentError):
        return None
    try:
        dialect.import_dbapi()
    except ImportError as error:
        driver = parsed.get_driver_name()
        backend = parsed.get_backend_name()
        package = DRIVER_PACKAGES.get(driver, driver)
        return (
            f"SQLAlchemy {sqlalchemy.__version__} opens {backend} URLs like this one with "
            f"the '{driver}' driver, which is not installed ({error}); install it: pip install "
            f"{package} (or name an installed driver in the URL, e.g. {backend}+DRIVER://...)"
        )
    return None
