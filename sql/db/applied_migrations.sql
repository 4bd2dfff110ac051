-- Every migration the database records, this binary's and any newer release's, in order.
SELECT version, description, installed_on, success
  FROM _sqlx_migrations
 ORDER BY version
