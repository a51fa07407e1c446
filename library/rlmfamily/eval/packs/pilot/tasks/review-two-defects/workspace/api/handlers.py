from api.reports import report_count, report_rows


def list_reports(conn, user):
    return {"count": report_count(conn, user.name), "rows": report_rows(conn, user.name)}
