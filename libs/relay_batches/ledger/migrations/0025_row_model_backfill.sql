-- The model of the rows stored before 0024, filled in a transaction of its own.
--
-- Safe on a big batch_rows: this transaction takes ROW EXCLUSIVE on the table, which no
-- read, insert, update or delete of other sessions conflicts with (only DDL and explicit
-- SHARE locks do), so jobs are created, released and read while it runs; its row locks
-- hold only the rows it rewrites, which nothing else updates (rows are written once; a
-- delete of one, by retention or by a deleted job, waits for the commit). Only rows
-- whose request is an object naming "model" are rewritten (a textual test that reads
-- nothing but the row): bare messages arrays, most stored rows, are read and left as
-- they are, already right with NULL. No index holds model, so a rewritten row may stay
-- on its page (a HOT update); the old versions are autovacuum's (batch_rows' scale
-- factor is 0.02, 0018). Rows stored meanwhile by the new code already have their model.
--
-- Reading a request never fails the migration: a NUL (\u0000) anywhere in the document
-- makes json refuse it, so it is read again with each NUL as another character (a model
-- that changes with that character held one: ''); an unreadable request, or a model that
-- is not a string, gives '' (as ledger/row_model.py reads them).

CREATE FUNCTION pg_temp.stored_row_model(request text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    found json;
BEGIN
    BEGIN
        found := request::json -> 'model';
    EXCEPTION WHEN untranslatable_character THEN
        found := replace(request, '\u0000', '\u0020')::json -> 'model';
        IF found::text IS DISTINCT FROM
           (replace(request, '\u0000', '\u0001')::json -> 'model')::text THEN
            RETURN '';  -- the NUL is in the model
        END IF;
    END;
    IF found IS NULL OR json_typeof(found) = 'null' THEN
        RETURN NULL;
    ELSIF json_typeof(found) <> 'string' THEN
        RETURN '';
    END IF;
    RETURN found #>> '{}';
EXCEPTION WHEN OTHERS THEN
    RETURN '';
END $$;

UPDATE batch_rows SET model = pg_temp.stored_row_model(request)
WHERE model IS NULL AND left(request, 1) = '{' AND strpos(request, '"model"') > 0;

DROP FUNCTION pg_temp.stored_row_model(text);
