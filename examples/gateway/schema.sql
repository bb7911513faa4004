-- The rules table the gateway reads with -rules-dsn, and a trigger that tells it at once
-- when the table changes (LISTEN rate_limit_rule_changed); without the trigger it still
-- reads the table every -reload.
CREATE TABLE IF NOT EXISTS rate_limit_rule (
    id                 BIGSERIAL PRIMARY KEY,
    tenant_id          VARCHAR(64)  NOT NULL,
    route_id           VARCHAR(64)  NOT NULL,
    capacity           INT          NOT NULL CHECK (capacity > 0),
    refill_per_second  INT          NOT NULL CHECK (refill_per_second > 0),
    in_flight          INT          NOT NULL DEFAULT 0 CHECK (in_flight >= 0), -- 0: no limit
    quota              TEXT         NOT NULL DEFAULT '', -- '10000 per month in America/New_York'; '': none
    updated_at         TIMESTAMPTZ  NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, route_id)
);
-- a table made before in_flight: requests in progress at once per (tenant, route)
ALTER TABLE rate_limit_rule ADD COLUMN IF NOT EXISTS in_flight INT NOT NULL DEFAULT 0 CHECK (in_flight >= 0);
-- and one made before quota: the tenant's calendar quota beside the rate
ALTER TABLE rate_limit_rule ADD COLUMN IF NOT EXISTS quota TEXT NOT NULL DEFAULT '';

CREATE OR REPLACE FUNCTION rate_limit_rule_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('rate_limit_rule_changed', '');
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS rate_limit_rule_changed ON rate_limit_rule;
CREATE TRIGGER rate_limit_rule_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rate_limit_rule
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limit_rule_notify();
