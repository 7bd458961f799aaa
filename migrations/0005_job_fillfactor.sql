-- The job table goes back to PostgreSQL's default fillfactor (100). With 80, every page of
-- done rows kept a fifth of itself free, and the free space map offered those pages to every
-- update that could not stay on its own page (none of the queue's updates are HOT, and a page
-- of jobs has room for a few of its jobs' new versions at most). On a table of 5,000,000 done
-- rows each finished job's new version went to a different old page, read back into shared
-- buffers and written out again: 214,000 heap reads for a drain of 100,000 jobs against
-- 31,000 at fillfactor 100, and a quarter less throughput than on a small table
-- (bench/README.md, "Scale"). Pages written before this migration keep their free room until
-- new versions fill it (at 100, a dozen to a page instead of one), or the table is rewritten.
ALTER TABLE {schema}.job RESET (fillfactor);
