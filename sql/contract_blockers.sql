-- `migrate --contract`: who may be a relay older than the requirement it records, besides the
-- registered ones (whose versions are judged by the caller): owners of live leases that are not
-- registered (a relay of before 0.2.0, which did not register), and sessions on this database
-- named as such relays named themselves ($1, application_name `outbox-relay`).
SELECT 'lease owner ' || quote_literal(owner)
FROM (SELECT DISTINCT c.owner
      FROM {claims} AS c
      WHERE c.until > now()
        AND NOT EXISTS (SELECT FROM {relays} AS r WHERE r.relay_id = c.owner AND r.seen_until > now())) AS o
UNION ALL
SELECT 'session ' || pid || ' (application_name ' || quote_literal(application_name) || coalesce(', from ' || client_addr::text, '') || ')'
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1
