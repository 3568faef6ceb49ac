-- A batch written in one statement that commits on its own (read first,
-- no lock held in between) aborts through this function when a row it
-- planned on was changed by a writer outside gateway-store: the
-- statement's error rolls back everything it did. The SQLSTATE is
-- gantry's own, matched by the store.
CREATE FUNCTION gantry_abort_batch(reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION '%', reason USING ERRCODE = 'GA001';
END
$$;
