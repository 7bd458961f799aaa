-- The job filter's predicate, shared by every statement that takes a JobFilter
-- (kernel/jobfilter.py, which binds its parameters).
-- noun: jobfilter
--
-- Fragments (`-- fragment: NAME`) are loaded with the named blocks of this folder by
-- jobtui/kernel/db.py, and a statement that writes {NAME} gets the fragment's text there, as
-- if written out: each statement is planned as before, its own conditions (its window of ids,
-- its statuses) choosing the index. Values are always bound parameters.

-- fragment: jobfilter_predicate
-- The jobs of the filter, of the job table as `j`; a NULL field is no condition. `matcher` is
-- the error matcher of `jobtui dead --error` and the bulk actions (the error's first line or
-- its fingerprint), `error` the pattern of `jobtui jobs --error` (the whole last error). Ages
-- count back from `at` (a bulk run's start: a resumed run selects the same jobs), else now().
(%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
  AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(matcher)s::text IS NULL OR split_part(j.last_error, E'\n', 1) ~* %(matcher)s::text
       OR j.error_fingerprint ~* %(matcher)s::text)
  AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
  AND (%(older_than)s::float8 IS NULL OR j.created_at < coalesce(%(at)s::timestamptz, now()) - make_interval(secs => %(older_than)s::float8))
  AND (%(newer_than)s::float8 IS NULL OR j.created_at >= coalesce(%(at)s::timestamptz, now()) - make_interval(secs => %(newer_than)s::float8))
  AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s::timestamptz)
  AND (%(error)s::text IS NULL OR j.last_error ~ %(error)s::text)
