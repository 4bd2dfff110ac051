-- This rebuilder stopped polling: fact writes ring again.
DELETE FROM digest_pollers WHERE rebuilder = $1
