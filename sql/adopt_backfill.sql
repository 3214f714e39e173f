-- One batch of the backfill: the rows of one range of pages still without a sequence value.
-- Its own short transaction; a range of {blocks} pages ($1 up to $2) bounds the work (and the
-- row locks held) whatever the table's size, and is read with a TID range scan. `WHERE {seq}
-- IS NULL` makes it resumable: a run killed half-way leaves numbered rows numbered.
UPDATE {base} SET {seq} = nextval({backfill_sequence_literal})
WHERE ctid >= format('(%s,0)', $1::bigint)::tid
  AND ctid < format('(%s,0)', $2::bigint)::tid
  AND {seq} IS NULL;
