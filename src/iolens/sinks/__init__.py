"""Writers of records and reports: iostat text and JSON for now."""
