-- Labels of the object before the change, so a watch with a label selector
-- can tell a subscriber that an object stopped matching. NULL for ADDED.
ALTER TABLE gateway_events ADD COLUMN prev_labels BYTEA;

-- Events up to this revision have been compacted away: a watch may resume
-- from this revision or later. Revision 1 is the bootstrap revision.
CREATE TABLE store_compaction (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    revision BIGINT NOT NULL
);
INSERT INTO store_compaction (id, revision) VALUES (1, 1);

CREATE INDEX gateway_events_created_at ON gateway_events (created_at_ms);

-- Event types are read as INTEGER by both backends.
ALTER TABLE gateway_events ALTER COLUMN event_type TYPE INTEGER;
