-- The `measured` CTE of every claim: the chosen rows (`id`, `attempts`, `bytes` and the
-- columns the claim returns) with their `refusal`, the reason a row is quarantined by the
-- claim instead of leased (sql/claim.sql), and what each holds of the byte budget (`held`:
-- nothing for a refused row, which is not read). Comment lines are dropped and the rest
-- joined into one line.
SELECT w.*, CASE WHEN w.refusal IS NULL THEN w.bytes ELSE 0 END AS held
FROM (SELECT chosen.*,
CASE WHEN bytes > {max_payload} THEN 'too_large'
WHEN attempts >= {max_attempts} THEN 'max_attempts' END AS refusal
FROM chosen) AS w
