from shop.customers import find_customer


def customer_page(conn, request):
    row = find_customer(conn, request.args["email"])
    return {"name": row[1]} if row else {"error": "not found"}
