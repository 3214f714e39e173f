-- How many of these rows (id, our lease_token) another owner has claimed since: their
-- lease_token moved on. Asked only when a settlement changed fewer rows than it carried. A row
-- that is gone (deleted on acknowledgement) or still carries our token was settled by us, for
-- example by an earlier try of the same settlement whose answer the connection lost.
SELECT count(*)
FROM {table} AS o
JOIN unnest($1::bigint[], $2::bigint[]) AS u(id, lease_token) ON o.id = u.id
WHERE o.lease_token <> u.lease_token
