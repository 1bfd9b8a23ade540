-- The row tables' statistics follow a new job, not a tenth of the table. Autoanalyze
-- reads a table again after autovacuum_analyze_threshold + scale_factor x its rows have
-- changed (by default 50 + 10 %): on a ledger holding 10 million rows a job of a
-- million rows can be stored and run to its end on statistics taken before it existed.
-- From here a table is read again after 50,000 rows + 1 % of it have changed (about a
-- tenth of a second of sampling, at most every few seconds while jobs run at full
-- speed). The dispatcher's reads of a job's rows do not depend on these statistics
-- (ledger/unfinished.py); the results pages, the stats and the retention's scans
-- plan better with them. A storage parameter: SHARE UPDATE EXCLUSIVE, no scan, and it
-- does nothing where autovacuum is off.
ALTER TABLE batch_rows SET (autovacuum_analyze_scale_factor = 0.01,
                            autovacuum_analyze_threshold = 50000);
ALTER TABLE row_results SET (autovacuum_analyze_scale_factor = 0.01,
                             autovacuum_analyze_threshold = 50000);
