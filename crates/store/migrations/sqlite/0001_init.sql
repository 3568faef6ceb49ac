-- One store-wide revision, advanced by every committed change. It starts at
-- 1 (a bootstrap revision) so that ListGateways never answers revision 0.
CREATE TABLE store_revision (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    revision INTEGER NOT NULL
);
INSERT INTO store_revision (id, revision) VALUES (1, 1);

-- Current Gateways. `object` is the protobuf-encoded Gateway; the columns
-- beside it repeat what queries and operators need to read without decoding.
CREATE TABLE gateways (
    name TEXT PRIMARY KEY NOT NULL,
    uid TEXT NOT NULL,
    generation INTEGER NOT NULL,
    observed_generation INTEGER NOT NULL,
    resource_version INTEGER NOT NULL,
    deleting INTEGER NOT NULL DEFAULT 0,
    object BLOB NOT NULL
);

-- One row per change, written in the change's transaction: the watch log.
CREATE TABLE gateway_events (
    revision INTEGER PRIMARY KEY NOT NULL,
    event_type INTEGER NOT NULL,
    name TEXT NOT NULL,
    object BLOB NOT NULL,
    created_at_ms INTEGER NOT NULL
);
