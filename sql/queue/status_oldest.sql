-- Status: the oldest queued turn per lane.
SELECT lane, age_s, queued FROM kvmem_oldest_queued ORDER BY lane
