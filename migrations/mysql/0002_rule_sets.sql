-- Rule sets: the runtime-tunable configuration operators change while the service runs, one row
-- per version, and each instance's latest report of the version it applied.
-- Same tables and invariants as migrations/sqlite/0002_rule_sets.sql; keep the two in step, and
-- the states in step with rebate_store::RuleState (a contract test writes every state it knows).
--
-- Limits match the store's (rebate_store::rules): VARCHAR counts characters, LENGTH() bytes.
-- The document is MEDIUMTEXT because 64 KiB is one byte more than TEXT holds.

CREATE TABLE rule_sets (
    -- Assigned by the store as the highest version + 1, inside the inserting transaction.
    version           BIGINT        NOT NULL,
    document          MEDIUMTEXT    NOT NULL,
    author            VARCHAR(128)  NOT NULL,
    reason            VARCHAR(1024) NOT NULL,
    created_at_ms     BIGINT        NOT NULL,
    -- When it last became active; NULL if it never was.
    activated_at_ms   BIGINT        NULL,
    state             VARCHAR(16)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    rollout           TEXT          NULL,
    schedule_from_ms  BIGINT        NULL,
    schedule_until_ms BIGINT        NULL,
    -- The version to go back to when this one is reverted.
    previous_version  BIGINT        NULL,
    verdict           TEXT          NULL,
    updated_at_ms     BIGINT        NOT NULL,
    -- 1 on the active row, NULL on every other, so that the unique key below admits at most one
    -- active row: MySQL and MariaDB have no partial index. The store supersedes the active row in
    -- the same transaction that activates another; this makes the database refuse a second one
    -- regardless (a writer that raced another fails on it and runs again).
    active_marker     TINYINT       AS (CASE WHEN state = 'active' THEN 1 END) STORED,
    PRIMARY KEY (version),
    UNIQUE KEY rule_sets_one_active (active_marker),
    -- The active row, and every canary or scheduled row oldest first.
    KEY rule_sets_by_state (state, version),
    CONSTRAINT rule_sets_version_positive CHECK (version >= 1),
    CONSTRAINT rule_sets_document_size CHECK (LENGTH(document) <= 65536),
    CONSTRAINT rule_sets_document_json CHECK (JSON_VALID(document)),
    CONSTRAINT rule_sets_state_known CHECK (state IN ('staged', 'canary', 'active', 'rolled_back',
                                                      'superseded', 'scheduled', 'aborted',
                                                      'expired')),
    CONSTRAINT rule_sets_rollout_size CHECK (LENGTH(rollout) <= 16384),
    CONSTRAINT rule_sets_rollout_json CHECK (JSON_VALID(rollout)),
    CONSTRAINT rule_sets_previous_version_positive CHECK (previous_version >= 1),
    CONSTRAINT rule_sets_verdict_size CHECK (LENGTH(verdict) <= 16384),
    CONSTRAINT rule_sets_verdict_json CHECK (JSON_VALID(verdict))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- One row per instance, replaced by each of its reports (every few seconds). The id compares
-- exactly (utf8mb4_bin: 'Pod-A' is not 'pod-a') and sorts by bytes, as SQLite's does.
CREATE TABLE rule_instances (
    instance_id     VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- 0: the instance applies no rule set.
    applied_version BIGINT       NOT NULL,
    reported_at_ms  BIGINT       NOT NULL,
    report          TEXT         NOT NULL,
    PRIMARY KEY (instance_id),
    CONSTRAINT rule_instances_id_not_empty CHECK (CHAR_LENGTH(instance_id) >= 1),
    CONSTRAINT rule_instances_applied_version_not_negative CHECK (applied_version >= 0),
    CONSTRAINT rule_instances_report_size CHECK (LENGTH(report) <= 16384),
    CONSTRAINT rule_instances_report_json CHECK (JSON_VALID(report))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;
