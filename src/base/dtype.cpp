// Placeholder until the dtype implementation lands.
