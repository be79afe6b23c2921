-- Rule sets: the runtime-tunable configuration operators change while the service runs, one row
-- per version, and each instance's latest report of the version it applied.
-- Same tables and invariants as migrations/mysql/0002_rule_sets.sql; keep the two in step, and the
-- states in step with rebate_store::RuleState (a contract test writes every state it knows).
--
-- Limits match the store's (rebate_store::rules): names in characters, as length() counts TEXT
-- and MySQL's VARCHAR counts them; JSON text in bytes. Rowid tables, not WITHOUT ROWID: rows
-- carry documents of up to 64 KiB, which WITHOUT ROWID tables store poorly.

CREATE TABLE rule_sets (
    -- Assigned by the store as the highest version + 1, inside the inserting transaction.
    version           INTEGER NOT NULL PRIMARY KEY CHECK (version >= 1),
    document          TEXT    NOT NULL
                              CHECK (length(CAST(document AS BLOB)) <= 65536
                                     AND json_valid(document)),
    author            TEXT    NOT NULL CHECK (length(author) <= 128),
    reason            TEXT    NOT NULL CHECK (length(reason) <= 1024),
    created_at_ms     INTEGER NOT NULL,
    -- When it last became active; NULL if it never was.
    activated_at_ms   INTEGER,
    state             TEXT    NOT NULL
                              CHECK (state IN ('staged', 'canary', 'active', 'rolled_back',
                                               'superseded', 'scheduled', 'aborted', 'expired')),
    rollout           TEXT    CHECK (length(CAST(rollout AS BLOB)) <= 16384
                                     AND json_valid(rollout)),
    schedule_from_ms  INTEGER,
    schedule_until_ms INTEGER,
    -- The version to go back to when this one is reverted.
    previous_version  INTEGER CHECK (previous_version >= 1),
    verdict           TEXT    CHECK (length(CAST(verdict AS BLOB)) <= 16384
                                     AND json_valid(verdict)),
    updated_at_ms     INTEGER NOT NULL
) STRICT;

-- At most one active row. The store supersedes the active row in the same transaction that
-- activates another; this index makes the database refuse a second one regardless.
CREATE UNIQUE INDEX rule_sets_one_active ON rule_sets (state) WHERE state = 'active';

-- The active row, and every canary or scheduled row oldest first.
CREATE INDEX rule_sets_by_state ON rule_sets (state, version);

-- One row per instance, replaced by each of its reports (every few seconds).
CREATE TABLE rule_instances (
    instance_id     TEXT    NOT NULL PRIMARY KEY CHECK (length(instance_id) BETWEEN 1 AND 128),
    -- 0: the instance applies no rule set.
    applied_version INTEGER NOT NULL CHECK (applied_version >= 0),
    reported_at_ms  INTEGER NOT NULL,
    report          TEXT    NOT NULL
                            CHECK (length(CAST(report AS BLOB)) <= 16384 AND json_valid(report))
) STRICT;
