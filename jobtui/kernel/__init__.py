"""The kernel: states and records, input checks, safe text, and how one named statement of
`sql/` runs on one connection. Nothing here imports another layer of jobtui."""
