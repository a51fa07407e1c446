"""What every room of the service stands on: the one settings object (each section defined beside the room
that reads it), the database layer, the error root, the spec loader, the webhook rule, the push signing keys
and telemetry. It imports no room, but ``core.settings`` gathers the rooms' settings sections."""
