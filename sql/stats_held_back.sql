-- Under --order-by transaction, sql/stats.sql's `watermark`: of the first unsent rows it read
-- (`unsent_head`), how many the claims' watermark holds back, and the age of the oldest of
-- them. Comment lines are dropped and the rest joined into one line.
(SELECT count(*) FROM unsent_head WHERE NOT {released}),
coalesce(greatest(extract(epoch FROM now() - (SELECT min(created_at) FROM unsent_head WHERE NOT {released})), 0)::float8, 0)
