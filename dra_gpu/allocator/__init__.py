"""The scheduler's structured allocator semantics (pure): pools, requests, first fit, explain."""
