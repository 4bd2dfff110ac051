-- Serialises the install of functions and views: workers starting together would race on
-- DROP/CREATE of the same objects. Held until the install transaction ends.
SELECT pg_advisory_xact_lock(hashtext('kvmem:install_replaceable'))
