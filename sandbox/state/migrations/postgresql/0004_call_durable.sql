-- A durable call's command (an exec with a record: engine/handover.py) runs as a process of its
-- own in its sandbox, which outlives its replica: what another replica needs to adopt it when the
-- replica that started it is gone (its process id, timeout, trace and start), as JSON text.
ALTER TABLE calls ADD COLUMN durable TEXT;
