//! The public routes' path templates, named once for the router and for the edge, which tells a
//! list page's batch from an item page by its matched route.

/// One item's quote: an item page.
pub const ITEM_ROUTE: &str = "/api/v1/items/{platform}/{item_id}/rebate";

/// Up to `http.max_batch_items` quotes at once: a list page's items.
pub const BATCH_ROUTE: &str = "/api/v1/items:batch";
