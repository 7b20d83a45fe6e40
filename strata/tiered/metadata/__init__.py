"""RemoteLogMetadataManager implementations and the __remote_log_metadata record serde."""
