-- The serving roles' privileges: DML, never DDL (docs/OPERATIONS.md "Database users"). Applied after the
-- migrations by every `specialists db upgrade` (migrations/env.py), as the schema's owner: in production the
-- migration job, whose user owns every table; on one machine the single local user, which owns them too.
--
--   specialists_edge      the API and gRPC services       specialists_worker    the workers and their job processes
--   specialists_operator  the console, the drill job and operators' commands
--
-- In production Terraform creates these as login users (infra/database.tf) before the first migration; anywhere
-- else they are made here without a login, so that the grants (and tests/deploy/test_database_roles.py) hold the
-- same. Each gets: the schema's USAGE (not CREATE), SELECT/INSERT/UPDATE/DELETE on the service's tables, the
-- sequences, EXECUTE on the ledger's functions; only SELECT on the schema's bookkeeping (alembic_version,
-- schema_compatibility: the readiness check reads them, nothing but a migration writes them). No TRUNCATE,
-- REFERENCES or TRIGGER, and nobody else may create in the schema.
DO $grants$
DECLARE
  serving text;
  bookkeeping text;
BEGIN
  FOREACH serving IN ARRAY ARRAY['specialists_edge', 'specialists_worker', 'specialists_operator'] LOOP
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = serving) THEN
      BEGIN
        EXECUTE 'CREATE ROLE ' || quote_ident(serving) || ' NOLOGIN';
      EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- another database's upgrade on the same server made it at the same moment (roles are per server)
      END;
    END IF;
    EXECUTE 'REVOKE CREATE ON SCHEMA public FROM ' || quote_ident(serving);
    EXECUTE 'GRANT USAGE ON SCHEMA public TO ' || quote_ident(serving);
    EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ' || quote_ident(serving);
    EXECUTE 'GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO ' || quote_ident(serving);
    EXECUTE 'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO ' || quote_ident(serving);
    FOREACH bookkeeping IN ARRAY ARRAY['alembic_version', 'schema_compatibility'] LOOP
      IF to_regclass('public.' || bookkeeping) IS NOT NULL THEN  -- an upgrade to a revision before 0080 has one
        EXECUTE 'REVOKE INSERT, UPDATE, DELETE ON TABLE ' || quote_ident(bookkeeping) || ' FROM ' || quote_ident(serving);
      END IF;
    END LOOP;
  END LOOP;
END
$grants$;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
