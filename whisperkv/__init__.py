"""whisperkv: Whisper speech recognition with first-class Self-KV and Cross-KV caches."""
