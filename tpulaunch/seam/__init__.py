"""The ground floor every folder may stand on: which engines there are (`registry.py`), what each declares about
itself (`about.py`: `EngineAbout`, read without the library it trains with) and what this machine has installed
(`installed.py`, without importing it). Nothing here imports another tpulaunch folder."""
