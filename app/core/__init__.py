"""The shared layer: what several products of the app use, owned here once. Paths and user data,
request ids, the settings records (AppSettings, EngineSettings; JSON on disk), the messages that
cross the engine worker's thread boundary, chat storage (SQLite) and its crash recovery, model
discovery on disk, the load generator's logic, and the context and pool arithmetic. It may import
the engine's public API and nothing else of app/: the products (cli, desktop, serve, remote,
bench) sit above it."""
