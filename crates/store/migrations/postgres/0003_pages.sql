-- The object before the change (NULL for ADDED), so a page of a list can be
-- served as of an earlier revision: an object changed after it is shown as
-- the first later event's previous object.
ALTER TABLE gateway_events ADD COLUMN prev_object BYTEA;

-- The key that authenticates ListGateways page tokens, shared by every
-- replica on this database; written once by the first store to start.
CREATE TABLE store_keys (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    page_token_key BYTEA NOT NULL
);
