-- How many of a settlement's rows another claim holds now. Asked only when a retried
-- settlement found its claim gone: its first try may have applied (and removed the claim)
-- before the connection lost the answer, so a row in no claim was settled by us.
SELECT count(*)
FROM unnest($1::bigint[]) AS u(id)
WHERE EXISTS (SELECT 1 FROM {claims} AS l WHERE u.id = ANY (l.ids))
