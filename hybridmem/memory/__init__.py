"""The memory core: page pools, cache keys, conv placement, blocks, checkpoints, reclaim, policy,
the organization that joins them, the four layouts and the integrity checks
(``hybridmem/ORGANIZATIONS.md`` maps each paper concept to its file). Imports nothing, so a
caller pulls in only the modules it names."""
