-- `check`: the triggers and rules on the table $1 (quoted, possibly schema-qualified; an
-- adopted table's base table), each with what it can do to the relay, which deletes (or, with
-- --retention, updates) the rows it sent: (what it is, what it does to the relay, whether it
-- can undo the relay's settlements).
SELECT format('trigger %I (%s %s%s%s, function %s)',
              t.tgname,
              CASE WHEN t.tgtype & 2 = 2 THEN 'BEFORE'
                   WHEN t.tgtype & 64 = 64 THEN 'INSTEAD OF'
                   ELSE 'AFTER' END,
              concat_ws(' OR ', CASE WHEN t.tgtype & 4 <> 0 THEN 'INSERT' END,
                                CASE WHEN t.tgtype & 8 <> 0 THEN 'DELETE' END,
                                CASE WHEN t.tgtype & 16 <> 0 THEN 'UPDATE' END,
                                CASE WHEN t.tgtype & 32 <> 0 THEN 'TRUNCATE' END),
              CASE WHEN t.tgtype & 1 = 1 THEN ' FOR EACH ROW' ELSE ' FOR EACH STATEMENT' END,
              CASE t.tgenabled WHEN 'A' THEN ', ENABLE ALWAYS'
                               WHEN 'R' THEN ', ENABLE REPLICA'
                               WHEN 'D' THEN ', DISABLED'
                               ELSE '' END,
              t.tgfoid::regproc),
       CASE WHEN t.tgenabled = 'D' THEN 'disabled: does nothing'
            WHEN t.tgenabled = 'R' THEN 'fires only under session_replication_role = replica, which the relay never sets'
            WHEN t.tgtype & (8 | 16) = 0 THEN 'fires on the application''s writes, never on the relay''s'
            WHEN t.tgtype & 3 = 3 THEN 'can skip or change each row the relay settles (by returning NULL or another row); if it does, the relay stops claiming on the table and says so'
            WHEN t.tgtype & 1 = 1 THEN 'runs for every row the relay settles: its work is added to each event'
            ELSE 'runs once per settlement' END,
       t.tgenabled <> 'D' AND t.tgenabled <> 'R' AND t.tgtype & 3 = 3 AND t.tgtype & (8 | 16) <> 0
FROM pg_trigger AS t
WHERE t.tgrelid = to_regclass($1)
  AND NOT t.tgisinternal
UNION ALL
SELECT format('rule %I (ON %s%s)',
              r.rulename,
              CASE r.ev_type WHEN '1' THEN 'SELECT' WHEN '2' THEN 'UPDATE' WHEN '3' THEN 'INSERT' ELSE 'DELETE' END,
              CASE WHEN r.is_instead THEN ' DO INSTEAD' ELSE ' DO ALSO' END),
       CASE WHEN r.ev_type IN ('2', '4') THEN 'rewrites the relay''s settlements, which PostgreSQL then refuses: the relay cannot run'
            ELSE 'applies to the application''s writes, never to the relay''s' END,
       r.ev_type IN ('2', '4')
FROM pg_rewrite AS r
WHERE r.ev_class = to_regclass($1)
  AND r.rulename <> '_RETURN'
ORDER BY 1
