-- Status: warm and cold starts.
SELECT warm, cold, warm_ratio FROM kvmem_warm_ratio
