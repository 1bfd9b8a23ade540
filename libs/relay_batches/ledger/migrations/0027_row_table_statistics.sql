-- The row tables' statistics follow the jobs Relay stores and runs, not a tenth of the
-- table. Autoanalyze reads a table again after autovacuum_analyze_threshold +
-- autovacuum_analyze_scale_factor x its rows have changed (50 + 10 % by default): on a
-- ledger of ten million rows a job of a million is stored and runs to its end on
-- statistics taken before it existed. From here a row table is analyzed again after
-- 50,000 rows + 2 % of it changed, the bound the dispatcher's statistics keeper
-- (ledger/statistics.py) applies where autovacuum is off or late: an ANALYZE samples a
-- bounded number of rows (about a tenth of a second at any size), at most every ten
-- seconds or so while jobs run at full speed. The dispatcher's reads of a job's rows do
-- not depend on statistics (ledger/unfinished.py); result pages, job statistics,
-- retention's scans and claims plan better with them.
--
-- Storage parameters only: SHARE UPDATE EXCLUSIVE for a moment, no scan, no rewrite.
ALTER TABLE batch_rows SET (autovacuum_analyze_scale_factor = 0.02,
                            autovacuum_analyze_threshold = 50000);
ALTER TABLE row_results SET (autovacuum_analyze_scale_factor = 0.02,
                             autovacuum_analyze_threshold = 50000);
