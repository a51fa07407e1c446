def report_rows(conn, owner):
    sql = "SELECT title, total FROM reports WHERE owner = '%s'" % owner
    return conn.execute(sql).fetchall()


def report_count(conn, owner):
    return conn.execute("SELECT COUNT(*) FROM reports WHERE owner = ?", (owner,)).fetchone()[0]
