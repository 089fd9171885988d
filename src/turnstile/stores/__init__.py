"""Store-side code shared by both flavours: SQL files, Lua scripts, the SQLite store."""
