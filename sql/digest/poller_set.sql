-- This rebuilder polls the dirty markers for the next $2 ms, so fact writes need not ring.
INSERT INTO digest_pollers (rebuilder, until)
VALUES ($1, clock_timestamp() + $2 * interval '1 millisecond')
ON CONFLICT (rebuilder) DO UPDATE SET until = EXCLUDED.until
