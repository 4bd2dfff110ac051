-- The extensions the migrations create that this server cannot provide (neither installed
-- in the database nor available to CREATE EXTENSION); read before migrating.
SELECT want
  FROM unnest(ARRAY['vector']) AS want
 WHERE NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = want)
   AND NOT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = want)
