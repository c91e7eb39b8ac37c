"""Showing results: terminal tables (`report_text`), the Markdown/HTML report and its plots (`report`,
`plots`, `templates/`), live progress (`progress`) and MLflow tracking (`tracking`)."""
