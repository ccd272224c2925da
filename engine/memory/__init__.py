"""Memory as the engine reads it: device and host readings, keeping the host allocator lean, byte
counts as people write them, and the one error a load raises when a model does not fit."""
