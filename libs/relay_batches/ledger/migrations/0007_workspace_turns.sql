-- Fair claims (dispatcher): when workspaces tie for the next running slot, the one
-- served least recently goes first. The claim stamps each workspace it takes a job of.

ALTER TABLE workspaces ADD COLUMN IF NOT EXISTS last_claim_at timestamptz;
