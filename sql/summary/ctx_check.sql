-- ContextManager::initialize: the store exists (autocommit read).
SELECT 1 FROM contexts LIMIT 1
