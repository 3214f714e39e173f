-- Ordered + fair claims: the values of the fair key with pending rows (neither sent nor
-- quarantined), one probe each in the fair key's index (see claim_ordered.sql).
(SELECT {fair_bare} FROM {table}
 WHERE sent_at IS NULL AND quarantined_at IS NULL ORDER BY 1 LIMIT 1)
UNION ALL
SELECT (SELECT {fair_bare} FROM {table}
        WHERE sent_at IS NULL AND quarantined_at IS NULL AND {fair_bare} > fair_values.k
        ORDER BY 1 LIMIT 1)
FROM fair_values
WHERE fair_values.k IS NOT NULL
