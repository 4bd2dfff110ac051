-- How many turns the database holds, in any state: a demo refuses a real queue.
SELECT count(*) FROM turns
