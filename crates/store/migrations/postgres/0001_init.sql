-- One store-wide revision, advanced by every committed change. It starts at
-- 1 (a bootstrap revision) so that ListGateways never answers revision 0.
-- Writers take this row's lock (UPDATE ... RETURNING) and hold it until
-- commit, so revisions are assigned in commit order.
CREATE TABLE store_revision (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    revision BIGINT NOT NULL
);
INSERT INTO store_revision (id, revision) VALUES (1, 1);

-- Current Gateways. `object` is the protobuf-encoded Gateway; the columns
-- beside it repeat what queries and operators need to read without decoding.
CREATE TABLE gateways (
    name TEXT PRIMARY KEY,
    uid TEXT NOT NULL,
    generation BIGINT NOT NULL,
    observed_generation BIGINT NOT NULL,
    resource_version BIGINT NOT NULL,
    deleting BOOLEAN NOT NULL DEFAULT FALSE,
    object BYTEA NOT NULL
);

-- One row per change, written in the change's transaction: the watch log.
CREATE TABLE gateway_events (
    revision BIGINT PRIMARY KEY,
    event_type SMALLINT NOT NULL,
    name TEXT NOT NULL,
    object BYTEA NOT NULL,
    created_at_ms BIGINT NOT NULL
);
