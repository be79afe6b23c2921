-- The catalogue for MySQL 8.0.16+ / MariaDB 10.4+ (CHECK constraints are enforced from there on).
-- Same tables and invariants as migrations/sqlite/0001_catalogue.sql; keep the two in step.
--
-- Keys are ASCII with a binary collation: ids are digits and platforms lower-case words, so this
-- keeps the primary key small and makes 'Taobao' a different (and refused) platform instead of
-- silently matching 'taobao' under a case-insensitive collation.
-- Products and rates have no foreign key to each other on purpose: they are independent parts of
-- a quote, owned by different back-office flows, and either may exist without the other.

CREATE TABLE products (
    platform      VARCHAR(8)    CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    item_id       VARCHAR(20)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    title         VARCHAR(255)  NOT NULL,
    price_cents   BIGINT        NOT NULL,
    image_url     VARCHAR(1024) NOT NULL,
    shop_name     VARCHAR(128)  NOT NULL,
    status        VARCHAR(16)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- Grows with every change; caches compare it so an older value never replaces a newer one.
    version       BIGINT        NOT NULL,
    updated_at_ms BIGINT        NOT NULL,
    PRIMARY KEY (platform, item_id),
    CONSTRAINT products_platform_known CHECK (platform IN ('taobao', 'jd', 'pdd')),
    CONSTRAINT products_item_id_digits CHECK (item_id REGEXP '^[0-9]{1,20}$'),
    CONSTRAINT products_price_not_negative CHECK (price_cents >= 0),
    CONSTRAINT products_status_known CHECK (status IN ('on_sale', 'delisted')),
    CONSTRAINT products_version_not_negative CHECK (version >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

CREATE TABLE rebate_rates (
    platform      VARCHAR(8)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    item_id       VARCHAR(20) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- Basis points: 100 = 1 %, 10000 = 100 %.
    rate_bps      INTEGER     NOT NULL,
    version       BIGINT      NOT NULL,
    updated_at_ms BIGINT      NOT NULL,
    PRIMARY KEY (platform, item_id),
    CONSTRAINT rebate_rates_platform_known CHECK (platform IN ('taobao', 'jd', 'pdd')),
    CONSTRAINT rebate_rates_item_id_digits CHECK (item_id REGEXP '^[0-9]{1,20}$'),
    CONSTRAINT rebate_rates_rate_in_range CHECK (rate_bps BETWEEN 0 AND 10000),
    CONSTRAINT rebate_rates_version_not_negative CHECK (version >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- The items worth loading into the caches before traffic arrives, best first per platform.
-- The column is `hot_rank`, not `rank`: RANK is a reserved word in MySQL 8.
CREATE TABLE hot_items (
    platform VARCHAR(8)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    item_id  VARCHAR(20) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    hot_rank INTEGER     NOT NULL,
    PRIMARY KEY (platform, item_id),
    KEY hot_items_by_rank (hot_rank),
    CONSTRAINT hot_items_platform_known CHECK (platform IN ('taobao', 'jd', 'pdd')),
    CONSTRAINT hot_items_item_id_digits CHECK (item_id REGEXP '^[0-9]{1,20}$'),
    CONSTRAINT hot_items_rank_positive CHECK (hot_rank >= 1)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;
