-- The catalogue: products, their rebate rates, and the warm-up list.
--
-- Tables are STRICT so a value of the wrong type can never be stored (the row mapper then only
-- has to check ranges and vocabularies), and WITHOUT ROWID because every read is a point lookup by
-- the (platform, item_id) primary key. The CHECKs mirror the domain types' invariants; the store
-- validates every row it reads as well, since data written by other tools may bypass them.
-- Products and rates have no foreign key to each other on purpose: they are independent parts of
-- a quote, owned by different back-office flows, and either may exist without the other.

CREATE TABLE products (
    platform      TEXT    NOT NULL CHECK (platform IN ('taobao', 'jd', 'pdd')),
    item_id       TEXT    NOT NULL
                          CHECK (length(item_id) BETWEEN 1 AND 20 AND item_id NOT GLOB '*[^0-9]*'),
    title         TEXT    NOT NULL,
    price_cents   INTEGER NOT NULL CHECK (price_cents >= 0),
    image_url     TEXT    NOT NULL,
    shop_name     TEXT    NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('on_sale', 'delisted')),
    -- Grows with every change; caches compare it so an older value never replaces a newer one.
    version       INTEGER NOT NULL CHECK (version >= 0),
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (platform, item_id)
) STRICT, WITHOUT ROWID;

CREATE TABLE rebate_rates (
    platform      TEXT    NOT NULL CHECK (platform IN ('taobao', 'jd', 'pdd')),
    item_id       TEXT    NOT NULL
                          CHECK (length(item_id) BETWEEN 1 AND 20 AND item_id NOT GLOB '*[^0-9]*'),
    -- Basis points: 100 = 1 %, 10000 = 100 %.
    rate_bps      INTEGER NOT NULL CHECK (rate_bps BETWEEN 0 AND 10000),
    version       INTEGER NOT NULL CHECK (version >= 0),
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (platform, item_id)
) STRICT, WITHOUT ROWID;

-- The items worth loading into the caches before traffic arrives, best first per platform.
-- The column is `hot_rank`, not `rank`: RANK is a reserved word in MySQL 8.
CREATE TABLE hot_items (
    platform TEXT    NOT NULL CHECK (platform IN ('taobao', 'jd', 'pdd')),
    item_id  TEXT    NOT NULL
                     CHECK (length(item_id) BETWEEN 1 AND 20 AND item_id NOT GLOB '*[^0-9]*'),
    hot_rank INTEGER NOT NULL CHECK (hot_rank >= 1),
    PRIMARY KEY (platform, item_id)
) STRICT, WITHOUT ROWID;

CREATE INDEX hot_items_by_rank ON hot_items (hot_rank);
