-- `kvmem status`: the summary lane by kind and state, and its latest failures.
SELECT kind, state, jobs FROM kvmem_summary_lane ORDER BY kind, state
