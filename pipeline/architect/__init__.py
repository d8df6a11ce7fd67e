"""Method B as the architect: module shapes searched on the data (docs/DESIGN.md "Method B as the architect")."""
