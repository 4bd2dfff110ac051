-- Why an attempt's generation stopped (issue 58): 'stop' when the model ended its reply,
-- 'length' when REPLY_MAX_TOKENS cut it off. OpenAI clients read "length" to offer
-- "continue", so the chat endpoint answers with this column. Null on failed attempts and
-- on rows written before it existed (read as 'stop'). Additive: a worker of the previous
-- release keeps inserting its rows without it.
ALTER TABLE turn_log ADD COLUMN finish_reason text;
