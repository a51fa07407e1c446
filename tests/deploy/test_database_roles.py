"""The serving roles' database privileges, as the migration job leaves them (migrations/grants.sql, applied by
every `specialists db upgrade`): DML on the service's tables, never DDL. On the real PostgreSQL of the suite,
each serving role taken with SET ROLE inside a transaction that is rolled back."""

from __future__ import annotations

import psycopg
import pytest

from core import db
from tests.deploy.manifests import Terraform
from tests.deploy.test_infra import DATABASE_USER_OF

SERVING = ("specialists_edge", "specialists_worker", "specialists_operator")
DDL = {
    "create a table": "CREATE TABLE h5_probe (id int)",
    "add a column": "ALTER TABLE alembic_version ADD COLUMN probe int",
    "drop a table": "DROP TABLE schema_compatibility",
    "create a function": "CREATE FUNCTION h5_probe() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "truncate": "TRUNCATE alembic_version",
    "write the schema's revision": "UPDATE alembic_version SET version_num = version_num",
}


@pytest.fixture(scope="module")
def upgraded(database_url: str) -> str:
    db.upgrade(database_url)  # what the migration job runs: the migrations, then the grants
    return database_url.replace("postgresql+psycopg://", "postgresql://")


def as_role(url: str, role: str, statement: str) -> None:
    with psycopg.connect(url) as conn:
        try:
            conn.execute(f"SET ROLE {role}")
            conn.execute(statement)
        finally:
            conn.rollback()


@pytest.mark.parametrize("role", SERVING)
@pytest.mark.parametrize("what", sorted(DDL))
def test_a_serving_role_cannot_change_the_schema(upgraded, role, what):
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_role(upgraded, role, DDL[what])


@pytest.mark.parametrize("role", SERVING)
def test_a_serving_role_reads_and_writes_the_services_tables_and_reads_the_schemas_revision(upgraded, role):
    as_role(upgraded, role, "SELECT version_num FROM alembic_version")
    with psycopg.connect(upgraded) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename NOT IN ('alembic_version', 'schema_compatibility')")]
    assert len(tables) > 10
    for table in tables:  # DELETE of nothing: the privilege is checked, no row is touched
        as_role(upgraded, role, f'DELETE FROM "{table}" WHERE false')
        as_role(upgraded, role, f'SELECT 1 FROM "{table}" LIMIT 0')


def test_the_deployment_connects_each_serving_service_as_one_of_the_granted_roles():
    tf = Terraform()
    users = {tf.resolve(tf.resource("google_sql_user", user)["name"]) for _, user in DATABASE_USER_OF.values()}
    assert users - {tf.default("database_user")} == set(SERVING)
