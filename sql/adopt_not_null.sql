-- NOT NULL without scanning the table under an ACCESS EXCLUSIVE lock: a CHECK added NOT VALID
-- (instant), validated under a SHARE UPDATE EXCLUSIVE lock that lets writes through, after
-- which SET NOT NULL is proved by the valid check (PostgreSQL 12+) and the check goes.
ALTER TABLE {base} DROP CONSTRAINT IF EXISTS {check};
ALTER TABLE {base} ADD CONSTRAINT {check} CHECK ({seq} IS NOT NULL) NOT VALID;

ALTER TABLE {base} VALIDATE CONSTRAINT {check};

ALTER TABLE {base} ALTER COLUMN {seq} SET NOT NULL;
ALTER TABLE {base} DROP CONSTRAINT IF EXISTS {check};
